"""fingerprint.container: what the runtime announces inside a container. Formats: podman's
/run/.containerenv (podman-run(1): `engine`, `name`, `id`, `image`, `imageid`, `rootless` as
key="value" lines, written in full for privileged containers, empty otherwise), docker's empty
/.dockerenv, Apptainer's APPTAINER_CONTAINER (the image path) and the `container` variable that
podman and systemd-nspawn set."""

from workloads.core.fingerprint import container_identity


def test_runtimes_as_they_announce_themselves(tmp_path, monkeypatch):
    for v in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "container"):
        monkeypatch.delenv(v, raising=False)
    assert container_identity(str(tmp_path)) is None
    (tmp_path / ".dockerenv").write_text("")
    assert container_identity(str(tmp_path)) == {"runtime": "docker", "image": None, "name": None}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    assert container_identity(str(tmp_path)) == {"runtime": "podman", "image": None, "name": None}
    (tmp_path / "run" / ".containerenv").write_text(
        'engine="podman-4.3.1"\nname="fb-node0"\nid="3f2a"\nimage="localhost/fabricbench:cpu"\n'
        'imageid="a56d0b37"\nrootless=0\n')
    assert container_identity(str(tmp_path)) == {"runtime": "podman-4.3.1", "image": "localhost/fabricbench:cpu",
                                                 "name": "fb-node0"}
    monkeypatch.setenv("APPTAINER_CONTAINER", "/shared/fabricbench-cuda.sif")
    assert container_identity(str(tmp_path)) == {"runtime": "apptainer", "image": "/shared/fabricbench-cuda.sif",
                                                 "name": None}
    monkeypatch.delenv("APPTAINER_CONTAINER")
    empty = tmp_path / "host"
    empty.mkdir()
    monkeypatch.setenv("container", "systemd-nspawn")
    assert container_identity(str(empty)) == {"runtime": "systemd-nspawn", "image": None, "name": None}

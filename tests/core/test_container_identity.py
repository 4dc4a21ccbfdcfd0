"""fingerprint.container: what the runtime announces inside a container. Formats: podman's
/run/.containerenv (podman-run(1): `engine`, `name`, `id`, `image`, `imageid`, `rootless` as
key="value" lines, written in full for privileged containers, empty otherwise), docker's empty
/.dockerenv, Apptainer's APPTAINER_CONTAINER (the image path) and the `container` variable that
podman and systemd-nspawn set."""

from workloads.core.fingerprint import container_identity


def test_runtimes_as_they_announce_themselves(tmp_path, monkeypatch):
    for v in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "container", "FABRICBENCH_IMAGE", "FABRICBENCH_IMAGE_ID"):
        monkeypatch.delenv(v, raising=False)
    assert container_identity(str(tmp_path)) is None
    (tmp_path / ".dockerenv").write_text("")
    assert container_identity(str(tmp_path)) == {"runtime": "docker", "image": None, "image_id": None, "name": None}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    assert container_identity(str(tmp_path)) == {"runtime": "podman", "image": None, "image_id": None, "name": None}
    (tmp_path / "run" / ".containerenv").write_text(
        'engine="podman-4.3.1"\nname="fb-node0"\nid="3f2a"\nimage="localhost/fabricbench:cpu"\n'
        'imageid="a56d0b37"\nrootless=0\n')
    assert container_identity(str(tmp_path)) == {"runtime": "podman-4.3.1", "image": "localhost/fabricbench:cpu",
                                                 "image_id": "a56d0b37", "name": "fb-node0"}
    monkeypatch.setenv("APPTAINER_CONTAINER", "/shared/fabricbench-cuda.sif")
    assert container_identity(str(tmp_path)) == {"runtime": "apptainer", "image": "/shared/fabricbench-cuda.sif",
                                                 "image_id": None, "name": None}
    monkeypatch.delenv("APPTAINER_CONTAINER")
    empty = tmp_path / "host"
    empty.mkdir()
    monkeypatch.setenv("container", "systemd-nspawn")
    assert container_identity(str(empty)) == {"runtime": "systemd-nspawn", "image": None, "image_id": None, "name": None}


def test_the_projects_images_name_their_tag_id_and_commit(tmp_path, monkeypatch):
    """tools/image.sh bakes the tag, commit and edit hash into the image (Dockerfile ENV), and
    its run line passes the image id: an empty /run/.containerenv (rootful podman under runc)
    or docker's /.dockerenv then still says which image and code made the record."""
    from workloads.core import fingerprint

    for v in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "container"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("FABRICBENCH_IMAGE", "localhost/fabricbench:cpu")
    monkeypatch.setenv("FABRICBENCH_IMAGE_ID", "sha256:a56d0b37")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    assert container_identity(str(tmp_path)) == {"runtime": "podman", "image": "localhost/fabricbench:cpu",
                                                 "image_id": "sha256:a56d0b37", "name": None}
    # no .git in the image: the baked commit (a checkout's own git wins where there is one)
    monkeypatch.setattr(fingerprint, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("FABRICBENCH_GIT_COMMIT", "65a65d933442e0ee2f7b9eb63d9c78098ea59f7f")
    monkeypatch.setenv("FABRICBENCH_GIT_DIRTY_HASH", "")
    fingerprint.git_commit.cache_clear()
    try:
        assert fingerprint.git_commit() == {"commit": "65a65d933442e0ee2f7b9eb63d9c78098ea59f7f", "dirty": False,
                                            "dirty_hash": None}
    finally:
        fingerprint.git_commit.cache_clear()

"""fabricbench's workloads: what runs on every rank, grouped by concern (docs/layout.md)."""
from pathlib import Path

# The checkout that holds conf/, launch/ and the git history the fingerprint records.
REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = str(REPO_ROOT / "conf")

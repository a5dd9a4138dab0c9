"""Install PostgreSQL's server from Debian's packages, for the test that runs a Prefect server on it
(tests/test_prefect_server.py; docs/operations.md says why production runs on PostgreSQL).
Idempotent: nothing happens when an `initdb` of some version is there already.

    python images/postgres_server.py

The package's own cluster is not used (the test starts a throwaway one on 127.0.0.1 in its
temporary folder); without root or apt-get it says what to install and exits with 1.
"""

from __future__ import annotations

import glob
import sys

from sandbox_tools import apt_install

INITDB_GLOB = "/usr/lib/postgresql/*/bin/initdb"


def main() -> int:
    return 0 if apt_install("postgresql", "initdb", found=bool(glob.glob(INITDB_GLOB))) else 1


if __name__ == "__main__":
    sys.exit(main())

"""`python -m mds`: the same command as `mds`."""

from mds.cli.main import run

if __name__ == "__main__":
    run()

"""``python scripts/build_tables.py ...``: the same as ``sve-tables`` (``sve/cli/tables.py``)."""

from sve.cli.tables import entry

if __name__ == "__main__":
    entry()

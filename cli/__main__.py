"""`python -m cli ...`: the `recsys` command line (how the elastic launcher starts its processes)."""

from cli import app

app(prog_name="recsys")

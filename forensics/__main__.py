from forensics.cli_quick import entry

entry()  # a plain `export` runs before typer is imported (see forensics.cli_quick)

import sys

from forensics.cli_quick import quick_main

# A plain `export` runs here, before typer is imported (see forensics.cli_quick).
if not quick_main(sys.argv[1:]):
    from forensics.cli import main

    main()

import sys

from autopar.cli.main import main

sys.exit(main())

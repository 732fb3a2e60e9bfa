"""Entry file for `python -m txnkeeper.verifier ...` and `spark-submit <this file> ...`.

spark-submit runs this file as a script, so it imports by absolute name only.
"""

import sys

from txnkeeper.verifier.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m gmeta_tf.data`` is ``gmeta-data``."""

import sys

from gmeta_tf.data.cli import main

sys.exit(main())

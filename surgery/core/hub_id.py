"""What a Hugging Face Hub repo id looks like (``namespace/name``).

Loading tells a Hub id from a local path by it, a card names its base model only when it is one,
and a push refuses any other repo name before any work.
"""

from __future__ import annotations

import re

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

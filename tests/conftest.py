"""Suite-wide settings: the tests never reach the network.

``HF_HUB_OFFLINE=1`` (inherited by the subprocesses the e2e tests start) makes a hub id that slipped into a test fail
at once instead of probing the hub; the tests of ``zerotir.models`` that check the online paths unset it themselves.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

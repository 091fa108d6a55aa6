"""SGLang adapter (targets sglang 0.5.23).

``launch_server`` (own options, SGLang flags, ``--dry-run``), the plugin entry point, and the
adapters it installs: replay state in SGLang's mamba pool (``pool``), Mamba-2 decode / verify /
commit routing (``mamba2``), GDN and KDA decode / verify routing (``gdn``, ``kda``), and the
class patches (``hooks``).
Nothing here imports sglang at import time.
"""

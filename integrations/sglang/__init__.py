"""SGLang adapter (serves sglang 0.5.17 and 0.5.23; ``versions`` holds where they differ).

``launch_server`` (own options, SGLang flags, ``--dry-run``), the plugin entry point, and the
adapters it installs: replay state in SGLang's mamba pool (``pool``), Mamba-2 decode / verify /
commit routing (``mamba2``), GDN and KDA decode / verify routing (``gdn``, ``kda``), and the
class patches (``hooks``).
Nothing here imports sglang at import time.
"""

"""SGLang adapter (targets sglang 0.5.23).

``launch_server`` (own options, SGLang flags, ``--dry-run``), the plugin entry point, and the
adapters it installs: replay state in SGLang's mamba pool (``pool``), Mamba-2 decode / verify /
commit routing (``mamba2``), GDN decode / verify routing (``gdn``), KDA decode routing
(``kda``), and the class patches (``hooks``). KDA verify is refused.
Nothing here imports sglang at import time.
"""

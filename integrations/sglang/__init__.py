"""SGLang adapter (targets sglang 0.5.23).

Built so far: ``launch_server`` (own options, SGLang flags, ``--dry-run``) and the plugin entry
point (a no-op with replay off). Not built: the adapters that serve with replay (README, Status).
Nothing here imports sglang at import time.
"""

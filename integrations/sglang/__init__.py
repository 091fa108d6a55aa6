"""SGLang adapter. Not built yet: see README.md, section Status."""

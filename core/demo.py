"""``python -m replayssm.demo``: transformers' own hybrid models (NemotronH, Qwen3-Next,
KimiLinear) decoded with their recurrent state in replayssm; see
``replayssm.integrations.transformers.demo`` (imported here lazily: core imports no framework).
"""


def main(argv=None) -> None:
    """Run the demo (arguments: ``--help``)."""
    from replayssm.integrations.transformers.demo import main as run

    run(argv)


if __name__ == "__main__":
    main()

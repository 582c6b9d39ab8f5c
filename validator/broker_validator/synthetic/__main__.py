"""``python -m broker_validator.synthetic``: the generator's command line (see :mod:`.cli`)."""

from broker_validator.synthetic.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

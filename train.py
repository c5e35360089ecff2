"""``python train.py method=sve dataset=flowers102``: the same as ``sve-train`` (``sve/cli/train.py``), kept so
that a checkout runs without the console scripts on its path."""

from sve.cli.train import main

if __name__ == "__main__":
    main()

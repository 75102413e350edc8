"""The ``pack SOURCE`` commands and the options they share (packer/cli.py is the command group)."""

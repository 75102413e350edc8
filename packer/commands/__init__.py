"""The ``pack SOURCE`` commands and the options they share (packer/cli.py is the command group).

- ``pack_cli``: the options of every ``pack SOURCE`` command and the ``PackSpec`` built from them;
- ``cli_options``: what several commands share: storage options, scratch folders, JSON output;
- ``append_cli``: ``--append`` on every source command;
- ``imagefolder_cli``: ``pack imagefolder``;
- ``imagelist_cli``: ``pack imagelist``;
- ``coco_cli``: ``pack coco``;
- ``parquet_cli``: ``pack parquet``;
- ``webdataset_cli``: ``pack webdataset``.
"""

"""The commands: argument parsing and what each prints, over the engine below (prepare, bench, runtime,
planning, validation). scripts/<name>.py and ``python -m mbridge_offload.cli.<name>`` run the same
``main``; each answers --help and argument errors before it imports Megatron."""

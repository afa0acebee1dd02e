"""The `rlperf` command: its table of subcommands, each defined in the folder that does the work, and the one
place where a command's bad input, machine fault or interruption becomes its line and exit code. It stands above
every other folder, which it imports; nothing imports it."""

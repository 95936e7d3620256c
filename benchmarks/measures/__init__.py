"""The measurements behind the benchmark scripts' subcommands, one module each (`bench_percall.py roofline` runs
`percall_roofline`): its docstring is the subcommand's help, `add_args(parser)` its options, `run(args)` the run."""

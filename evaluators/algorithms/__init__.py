"""Algorithm engineering (docs/method.md §5b): AtCoder Heuristic Contests 039 and 058, C++ programs judged on
the contests' public cases. `discover judge` reaches their judges through the Problem protocol (`judge`)."""

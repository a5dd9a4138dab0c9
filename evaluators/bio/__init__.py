"""Biology problems (docs/method.md §5d): candidates run in the `bio` image (images/bio)."""

"""Entry points: the `discover` command (typer) over discover/, evaluators/ and flows/."""

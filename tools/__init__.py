"""Command-line tools: stagemlc (the compiler) and stageml-opt (pass runner)."""

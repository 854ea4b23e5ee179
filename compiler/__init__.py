"""The StageML compiler: frontend, bt passes, partial evaluation, lowering."""

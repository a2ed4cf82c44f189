"""The Pulumi program of spot-trainer (entry point: ``__main__.py``; composition: ``program.build``)."""

"""The policy pack of spot-trainer: rules (pure), their Pulumi wrapping, and an offline runner."""

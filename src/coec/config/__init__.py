"""The config: JSON Schema validation, cross-references, and the model a stage reads against it."""

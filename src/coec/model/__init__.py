"""The model: loading, family adapters (arch/), surgery, the streamed model, the tiny model and the starter."""

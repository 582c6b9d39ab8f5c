"""The stateful broker: relays ordered, journaled, confirmed messages between the backend and the cloud."""

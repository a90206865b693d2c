"""The notification wire contract and the producer library."""

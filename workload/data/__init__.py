"""Data in: sources (a local folder or a bucket), the dataset rules and schema, reading, features and the
feature store, publishing onto the share, and the simulator."""

"""The SQLite WAL ledger (legion.db): schema, migrations and every table's API."""

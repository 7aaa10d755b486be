"""Whole epochs, the one home of their protocol: the ledger and its judge (`ledger`), the
records of an epoch held in memory until it is whole (`assembly`), each found in its epoch by
the offsets the manifest names or by its headers (`placement`), staged into the ledger with
the manifest (`staging`) as packed chunks (`chunks`), and published from it in one transaction
(`publisher`); and when a member reads the whole routes and asks the ledger about them
(`whole_routes`), by the units of queries that share a topic (`units`). The ledger's tables
are defined below, with the other state tables (`consumers.database.ledger_tables`)."""

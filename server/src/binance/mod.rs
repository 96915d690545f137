//! Binance protocol: wire types, REST client, stream client (being written).

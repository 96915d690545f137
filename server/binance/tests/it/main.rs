//! The Binance adapter against real Binance bytes: every recorded frame and REST body decodes to
//! the known facts (`wire`), and the REST and stream clients hold up over real sockets against a
//! server that replays Binance's answers and failures (`client`).

mod client;
mod wire;

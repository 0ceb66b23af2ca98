/// Why KV events could not be set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid --kv-events-config: {0}")]
    Config(String),
    #[error("KV events socket: {0}")]
    Io(String),
}

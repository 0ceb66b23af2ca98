//! OpenAI's Responses API on top of the chat path (docs/design.md §2, §9).
//!
//! - [`protocol`]: the request body and the response object;
//! - [`input`]: input items → chat messages, Responses tools → chat tools;
//! - [`output`]: the chat parser's deltas → output items and stream events;
//! - [`continuation`]: a chain's next prompt extending its KV token-exactly;
//! - [`run`]: a response from request to stored result (a chain of
//!   responses is one program, its KV kept between turns);
//! - [`store`]: stored responses, bounded in count and age.

pub mod continuation;
pub mod input;
pub mod output;
pub mod protocol;
pub mod run;
pub mod store;

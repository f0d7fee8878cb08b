//! Watch streams.

use crate::WatchEvent;
use futures::Stream;
use std::pin::Pin;

/// A watch stream: events in resourceVersion order until the watch times out, is closed by
/// [`crate::Cluster::close_watches`], or the resource stops being served.
pub type WatchStream = Pin<Box<dyn Stream<Item = WatchEvent> + Send + 'static>>;

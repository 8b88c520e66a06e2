//! Durable firings: (event, function) pairs waiting to become jobs. (Being written.)

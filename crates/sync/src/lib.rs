//! Synchronisation primitives for scalevfs (placeholder; being written).

//! FUSE front end (being written).

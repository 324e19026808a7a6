//! gw

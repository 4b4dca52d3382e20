// Package libsignal checks client/e2ee against an independent
// implementation of the Signal protocol, go.mau.fi/libsignal (a Go port of
// libsignal-protocol-java, GPL-3.0): sessions in each direction in classic
// X3DH mode (go.mau.fi/libsignal has no PQXDH, so the Parley device allows
// X3DH with SetAllowX3DH; its default refuses it), messages in order, out of order and after ratchet steps, and
// group messages through Sender Keys (libsignal-protocol-java's layout,
// e2ee.FormatLegacy). Only its tests import the GPL module; this module is
// not part of Parley's build.
package libsignal

// Package directlinetest drives the real Direct Line JavaScript client
// (botframework-directlinejs, run with Node.js) against a core started by its test, so
// that compatibility is checked by the client users actually embed.
package directlinetest

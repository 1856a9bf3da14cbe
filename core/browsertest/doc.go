// Package browsertest drives the core in headless Chromium (Debian's chromium package,
// through chromedp) against a `core serve` process that its tests build and start on
// loopback over a fresh PostgreSQL database: the server-rendered admin login pages
// (sign-in with the form, TOTP enrolment and sign-in with a code, sign-out, the lockout
// after repeated wrong passwords, the form with JavaScript turned off), the operators'
// console in front of a real sidecar (a tenant's override changed in the form, the
// Limits page showing a key driven over its limit), and Web Chat embedded on a page of
// another origin, as customers' sites do (CORS).
//
// The tests keep full-page screenshots under test-artifacts/browser/ at the repository
// root. They install the chromium package with apt-get when it is missing and the test
// runs as root, and Web Chat (the botframework-webchat package pinned in
// testdata/webchat) with npm ci.
package browsertest

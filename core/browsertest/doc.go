// Package browsertest drives the core's server-rendered admin login pages in headless
// Chromium (Debian's chromium package, through chromedp) against a `core serve` process
// that its test builds and starts on loopback over a fresh PostgreSQL database: sign-in
// with the form, TOTP enrolment and sign-in with a code, sign-out, the lockout after
// repeated wrong passwords, and the sign-in form with JavaScript turned off.
//
// The test keeps full-page screenshots of the login and lockout pages under
// test-artifacts/browser/ at the repository root. It installs the chromium package
// with apt-get when it is missing and the test runs as root.
package browsertest

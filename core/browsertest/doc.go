// Package browsertest drives the core in headless Chromium (Debian's chromium package,
// through chromedp) against a `core serve` process that its tests build and start on
// loopback over a fresh PostgreSQL database: the server-rendered admin login pages
// (sign-in with the form, TOTP enrolment and sign-in with a code, sign-out, the lockout
// after repeated wrong passwords, the form with JavaScript turned off), and Web Chat
// embedded on a page of another origin, as customers' sites do (CORS).
//
// The tests keep full-page screenshots under test-artifacts/browser/ at the repository
// root. They install the chromium package with apt-get when it is missing and the test
// runs as root, and Web Chat (the botframework-webchat package pinned in
// testdata/webchat) with npm ci.
package browsertest

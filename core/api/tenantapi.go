package api

import "github.com/gofiber/fiber/v2"

// tenantAPI registers the tenant API (server to server, x-api-key, snake_case JSON).
func (s *server) tenantAPI(r fiber.Router) {}

-- The origins a tenant's web pages are served from (the client API's CORS), and the
-- announcement of every change that the sidecars and the cores cache: a tenant's
-- status, API keys or allowed origins, and its channels' status, credentials or tenant,
-- are announced on the "tenant_changes" channel with the tenant's id when the change
-- commits, whatever made it (a command, the admin pages, SQL by hand).

-- +goose Up
-- Origins as browsers send them (scheme://host[:port], lower case, no default port),
-- checked and canonicalised by core/store before they are written.
ALTER TABLE tenants ADD COLUMN allowed_origins text[] NOT NULL DEFAULT '{}';

-- +goose StatementBegin
CREATE FUNCTION notify_tenant_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'tenants' THEN
        PERFORM pg_notify('tenant_changes', OLD.id::text);
    ELSE
        PERFORM pg_notify('tenant_changes', OLD.tenant_id::text);
        IF TG_OP = 'UPDATE' AND NEW.tenant_id <> OLD.tenant_id THEN
            PERFORM pg_notify('tenant_changes', NEW.tenant_id::text);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER tenants_notify_change AFTER UPDATE ON tenants FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
       OR OLD.allowed_origins IS DISTINCT FROM NEW.allowed_origins
       OR OLD.api_key_hash IS DISTINCT FROM NEW.api_key_hash
       OR OLD.previous_api_key_hash IS DISTINCT FROM NEW.previous_api_key_hash
       OR OLD.previous_api_key_expires_at IS DISTINCT FROM NEW.previous_api_key_expires_at)
    EXECUTE FUNCTION notify_tenant_change();

CREATE TRIGGER tenants_notify_delete AFTER DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION notify_tenant_change();

CREATE TRIGGER channels_notify_change AFTER UPDATE ON channels FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
       OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
       OR OLD.secret_hash IS DISTINCT FROM NEW.secret_hash
       OR OLD.publishable_key_hash IS DISTINCT FROM NEW.publishable_key_hash)
    EXECUTE FUNCTION notify_tenant_change();

CREATE TRIGGER channels_notify_delete AFTER DELETE ON channels
    FOR EACH ROW EXECUTE FUNCTION notify_tenant_change();

-- +goose Down
DROP TRIGGER channels_notify_delete ON channels;
DROP TRIGGER channels_notify_change ON channels;
DROP TRIGGER tenants_notify_delete ON tenants;
DROP TRIGGER tenants_notify_change ON tenants;
DROP FUNCTION notify_tenant_change();
ALTER TABLE tenants DROP COLUMN allowed_origins;

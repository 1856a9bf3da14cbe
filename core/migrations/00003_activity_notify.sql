-- Every new activity is announced on the "activities" channel as
-- "<conversation id>:<seq>" when its transaction commits, so that Direct Line streams on
-- every core instance push it, whichever path inserted it.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION notify_activity() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('activities', NEW.conversation_id::text || ':' || NEW.seq::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER activities_notify AFTER INSERT ON activities
    FOR EACH ROW EXECUTE FUNCTION notify_activity();

-- +goose Down
DROP TRIGGER activities_notify ON activities;
DROP FUNCTION notify_activity();

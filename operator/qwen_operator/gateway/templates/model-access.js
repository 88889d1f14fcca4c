// The model a limited API key's request names (nginx.conf's $access_model; spec.gateway.modelAccess),
// read the way the engine reads it: the top-level "model" of the JSON body, the last one where a key
// repeats, escapes decoded. "" when it names none (the engine then serves the base model); "?" when the
// body cannot be read (kept in a file, not JSON, not an object, a model that is not a string), which
// nginx.conf refuses: a body the gateway cannot read must not reach a model the key may not use.
function model(r) {
    var request;
    try {
        // throws for a body nginx kept in a file (above client_body_buffer_size): not read here, since
        // parsing megabytes would stall every request of this worker
        request = JSON.parse(r.requestText);
    } catch (e) {
        return "?";
    }
    if (request === null || typeof request !== "object" || Array.isArray(request)) {
        return "?";
    }
    var name = request.model;
    if (name === undefined || name === null) {
        return "";
    }
    return typeof name === "string" && name !== "?" ? name : "?";
}

export default { model };

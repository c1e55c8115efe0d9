// Hand-written Kotlin over the generated bindings: the client's events as a Flow.
package io.mpush.sdk

import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow

/**
 * Every event of a client created without a listener, as a cold [Flow]
 * that completes once the client has stopped:
 *
 * ```
 * client.events().collect { e -> when (e) { is PushEvent.Message -> show(e.message) else -> {} } }
 * ```
 * Collect it once: events are handed out one by one, not broadcast.
 */
fun PushClient.events(): Flow<PushEvent> = flow {
    while (true) {
        val event = nextEvent() ?: break
        emit(event)
    }
}

/** A `SessionStore` over any string key-value store (SharedPreferences: `prefs::getString` / `edit().putString`). */
class KeyValueSessionStore(
    private val key: String = "mpush.ticket",
    private val read: (String) -> String?,
    private val write: (String, String?) -> Unit,
) : SessionStore {
    override fun load(): String? = read(key)
    override fun save(ticket: String) = write(key, ticket.ifEmpty { null })
}

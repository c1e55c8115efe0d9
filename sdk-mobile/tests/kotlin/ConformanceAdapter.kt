// The conformance kit's adapter for the Kotlin bindings on the JVM:
//   mpush-conformance client --label kotlin -- java -cp ... ConformanceAdapterKt
// It speaks the kit's contract (conformance/README.md): the connection from
// MPUSH_CONFORMANCE_* variables, what the application sees as JSON lines on
// stdout, a message that needs an ACK acknowledged after it was printed.
import io.mpush.sdk.*
import kotlinx.coroutines.*
import kotlinx.coroutines.flow.collect

fun conformanceEnv(k: String): String = System.getenv("MPUSH_CONFORMANCE_$k") ?: ""

fun say(json: String) {
    println(json)
    System.out.flush()
}

/** A JSON string literal. */
fun quote(s: String): String = buildString {
    append('"')
    for (c in s) {
        when {
            c == '"' || c == '\\' -> append('\\').append(c)
            c < ' ' -> append(String.format("\\u%04x", c.code))
            else -> append(c)
        }
    }
    append('"')
}

/** The resume ticket, for as long as the process lives. */
class MemoryStore : SessionStore {
    @Volatile var ticket: String? = null
    override fun load(): String? = ticket
    override fun save(ticket: String) { this.ticket = ticket.ifEmpty { null } }
}

fun main(): Unit = runBlocking {
    val config = PushConfig(
        servers = listOf(conformanceEnv("SERVER")),
        deviceId = conformanceEnv("DEVICE"),
        publicKey = conformanceEnv("PUBLIC_KEY").ifEmpty { null },
    )
    val client = PushClient(config, MemoryStore(), null)
    client.connect()
    val user = conformanceEnv("USER")
    var binding: Job? = null
    client.events().collect { e ->
        when (e) {
            is PushEvent.Connected -> {
                say("""{"event":"connected","resumed":${e.resumed}}""")
                if (binding == null) {
                    binding = launch {
                        try { client.bind(user, listOf(), null) } catch (x: Exception) { System.err.println("bind: $x") }
                    }
                }
            }
            is PushEvent.Bound -> say("""{"event":"bound","userId":${quote(e.userId)}}""")
            is PushEvent.Message -> {
                val m = e.message
                say("""{"event":"message","text":${quote(String(m.content, Charsets.UTF_8))},"needsAck":${m.needsAck}}""")
                if (m.needsAck) client.ack(m.id)
            }
            is PushEvent.Kicked -> say("""{"event":"kicked","deviceId":${quote(e.deviceId)}}""")
            is PushEvent.Disconnected -> say("""{"event":"disconnected"}""")
            else -> {}
        }
    }
}
